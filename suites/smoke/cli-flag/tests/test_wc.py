import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

TOOL = Path("/app/wc.py")  # the agent's file, not a copy next to this test


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, check=False)


class WcTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "input.txt"
        self.path.write_text("one two three\nfour five\nsix\n", encoding="utf-8")

    def tearDown(self):
        self.dir.cleanup()

    def test_words(self):
        result = run(str(self.path))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "6")

    def test_lines(self):
        result = run("--lines", str(self.path))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "3")


if __name__ == "__main__":
    unittest.main()

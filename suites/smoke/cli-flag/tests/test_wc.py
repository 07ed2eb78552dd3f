import os
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, "/tests")

from candidate import run  # noqa: E402  (the agent's wc.py runs as the candidate user, never here)

TOOL = "/app/wc.py"  # the agent's file, not a copy next to this test


class WcTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        os.chmod(self.dir.name, 0o755)  # readable by the candidate user
        self.path = Path(self.dir.name) / "input.txt"
        self.path.write_text("one two three\nfour five\nsix\n", encoding="utf-8")
        os.chmod(self.path, 0o644)

    def tearDown(self):
        self.dir.cleanup()

    def test_words(self):
        result = run(["python3", TOOL, str(self.path)])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "6")

    def test_lines(self):
        result = run(["python3", TOOL, "--lines", str(self.path)])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "3")


if __name__ == "__main__":
    unittest.main()

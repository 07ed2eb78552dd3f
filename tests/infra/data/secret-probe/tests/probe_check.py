import re
import unittest
from pathlib import Path


class ProbeTest(unittest.TestCase):
    def test_secret_hash_written(self):
        text = Path("/app/secret.sha256").read_text(encoding="ascii").strip()
        self.assertRegex(text, re.compile(r"\A[0-9a-f]{64}\Z"))

    def test_no_network_but_loopback(self):
        self.assertEqual(Path("/app/net.txt").read_text(encoding="ascii").split(), ["lo"])


if __name__ == "__main__":
    unittest.main()

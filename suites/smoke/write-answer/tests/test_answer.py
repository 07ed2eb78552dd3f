import unittest
from pathlib import Path


class AnswerTest(unittest.TestCase):
    def test_answer(self):
        answer = Path("/app/answer.txt")
        # A regular file only (not a FIFO that blocks or a device), and only its first bytes are read.
        self.assertTrue(answer.is_file() and not answer.is_symlink(), "/app/answer.txt is not a regular file")
        with answer.open("rb") as handle:
            self.assertEqual(handle.read(64), b"1041\n")


if __name__ == "__main__":
    unittest.main()

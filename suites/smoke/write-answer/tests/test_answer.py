import unittest
from pathlib import Path


class AnswerTest(unittest.TestCase):
    def test_answer(self):
        answer = Path("/app/answer.txt")
        self.assertTrue(answer.is_file(), "/app/answer.txt does not exist")
        self.assertEqual(answer.read_text(encoding="utf-8"), "1041\n")


if __name__ == "__main__":
    unittest.main()

import sys
import unittest

sys.path.insert(0, "/tests")

from candidate import call  # noqa: E402  (the agent's stats.py runs in a child, never here)


class MeanTest(unittest.TestCase):
    def test_fraction(self):
        self.assertEqual(call("stats", "mean", [1, 2]), ("value", 1.5))

    def test_integers(self):
        self.assertEqual(call("stats", "mean", [2, 4, 6]), ("value", 4))

    def test_empty(self):
        kind, value = call("stats", "mean", [])
        self.assertEqual(kind, "raises", value)
        self.assertIn("ValueError", value)

    def test_total_unchanged(self):
        self.assertEqual(call("stats", "total", [1, 2, 3]), ("value", 6))


if __name__ == "__main__":
    unittest.main()

import sys
import unittest

sys.path.insert(0, "/app")

import stats  # noqa: E402


class MeanTest(unittest.TestCase):
    def test_fraction(self):
        self.assertEqual(stats.mean([1, 2]), 1.5)

    def test_integers(self):
        self.assertEqual(stats.mean([2, 4, 6]), 4)

    def test_empty(self):
        with self.assertRaises(ValueError):
            stats.mean([])

    def test_total_unchanged(self):
        self.assertEqual(stats.total([1, 2, 3]), 6)


if __name__ == "__main__":
    unittest.main()

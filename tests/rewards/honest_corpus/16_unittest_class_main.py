# ruff: noqa (model-written style, kept as is)
# entry: is_prime
# case: (2,) -> True
# case: (15,) -> False
# case: (97,) -> True
import unittest


def is_prime(n):
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


class TestIsPrime(unittest.TestCase):
    def test_small(self):
        self.assertTrue(is_prime(3))
        self.assertFalse(is_prime(4))


if __name__ == "__main__":
    unittest.main()

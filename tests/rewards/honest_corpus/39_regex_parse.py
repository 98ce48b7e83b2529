# ruff: noqa (model-written style, kept as is)
# entry: extract_emails
# case: ("mail a@b.com or c.d@e.org now",) -> ["a@b.com", "c.d@e.org"]
import re

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


def extract_emails(text):
    return _EMAIL.findall(text)

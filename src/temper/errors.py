"""User-facing errors.

A `TemperError` means the user gave us something we cannot use (a config key,
a dataset row, a model path, a prompt). The CLI prints its message as one line
and exits with status 2, without a traceback. Bugs in Temper itself are not
TemperErrors and keep their tracebacks.
"""


class TemperError(Exception):
    """Bad user input. The message names what is wrong and where."""


class ConfigError(TemperError):
    """An invalid config key, value or file."""


class DataError(TemperError):
    """A dataset that is missing, empty, or has a row without a mapped field."""


class ModelLoadError(TemperError):
    """A model or tokenizer path that does not exist or cannot be loaded."""


class PromptTooLongError(TemperError):
    """A prompt that does not fit in the model's context window."""


class InfraError(Exception):
    """The infrastructure failed an episode, not the policy: a server lost, a call that
    timed out on the wire, a full server, a sandbox that would not start. The rollout
    loop marks such an episode ``infra_error`` and retries it; it is never a reward."""

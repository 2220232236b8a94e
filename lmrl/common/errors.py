"""The errors lmrl raises on purpose, each a one-line message for the user, at the bottom of the
package so that every layer can raise them."""


class ConfigError(ValueError):
    """A config problem, explained in one line that names the key and its source."""


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite losses); the last checkpoint is intact."""


class NonFiniteOutputs(TrainingError):
    """A model's outputs (next-token probabilities) hold NaN or inf: its weights have blown up. The
    trainer says after which step and what to lower."""


class MissingPackage(ImportError):
    """An optional package a feature needs is not installed; the message says what to install."""

"""The toolkit's exceptions: each says what went wrong in words a user can act on.

The CLI turns any of these into one red line and exit status 1.
"""


class CuratorError(Exception):
    """Base of every error the toolkit raises on purpose."""


class CatalogError(CuratorError):
    """The catalog file cannot be opened, migrated or queried."""


class CatalogLockedError(CatalogError):
    """Another process holds the catalog file for writing."""


class ConfigError(CuratorError):
    """A recipe, config file or option is invalid."""


class HubError(CuratorError):
    """The Hugging Face Hub or dataset viewer refused or failed a request."""


class LLMError(CuratorError):
    """The agents' model endpoint failed or is misconfigured."""


class EndpointError(CuratorError):
    """A generation/serving endpoint is down, serves another model, or answered nonsense."""

"""What `specchat --version` prints: specchat's version and those of the libraries that run its
models, read from the installed packages' metadata. Nothing is imported for it, so the line comes
at once (torch alone takes seconds to import), and a bug report can quote it."""

from importlib.metadata import PackageNotFoundError, version

ENGINE_PACKAGES = ("torch", "transformers")


def installed_version(package: str) -> str:
    """The package's installed version, or 'not installed'."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def version_line() -> str:
    """e.g. 'specchat 0.1.0 (torch 2.13.0+cpu, transformers 5.24.0)'."""
    engines = ", ".join(f"{package} {installed_version(package)}" for package in ENGINE_PACKAGES)
    return f"specchat {installed_version('specchat')} ({engines})"

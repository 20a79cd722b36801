"""`specchat --version`'s line, from the installed packages' metadata."""

from importlib.metadata import version

from specchat.version import installed_version, version_line


def test_the_line_names_specchat_then_its_libraries():
    assert version_line() == (f"specchat {version('specchat')} (torch {version('torch')}, "
                              f"transformers {version('transformers')})")


def test_a_package_that_is_not_installed_says_so():
    assert installed_version("specchat-test-no-such-package") == "not installed"

"""The one GB helper: options given in GB (1e9 bytes) become bytes, None stays None."""

from specchat.transfer import gb, gb_to_bytes


def test_gb_options_become_bytes_and_back():
    assert gb_to_bytes(1.4) == 1_400_000_000 and gb_to_bytes(None) is None
    assert gb(gb_to_bytes(2.5)) == "2.50 GB"

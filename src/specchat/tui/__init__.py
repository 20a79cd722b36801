"""The `specchat run` chat app: a Textual UI over any engine that follows the decoding protocol."""

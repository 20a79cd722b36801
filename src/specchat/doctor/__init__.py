"""`specchat doctor`: what this machine offers for running a large target (`facts`), where its
weights should live and how large a draft tree pays (`advice`), and the report (`report`)."""

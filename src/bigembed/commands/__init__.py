"""One module per ``bigembed`` subcommand: parses its arguments, calls the library, prints."""

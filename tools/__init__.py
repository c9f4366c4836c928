"""Development tools, not part of the installed product: the generated reference pages (`make docs`: docgen,
doc_source, doc_trace, cli_reference), local Ray port picking and stopping (localray), run agreement checks
(agreement), the walk of a campaign through the code (walk)."""

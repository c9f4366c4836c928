"""`specdrill report`: summary.json, the console report and report.html for a finished run."""

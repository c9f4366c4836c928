"""The load worker behind loadshapes/locustfile.py, in three parts that one `WorkerState` (state.py) holds and
stops together: sending.py writes each planned request to the wire at its time, rows.py turns every answered
request into its trace row and writes the rows to Parquet in the gaps between sends, progress.py counts the rows
and reports (a progress file, Locust's console, the summary).

Import these only in a Locust process (they use gevent, which Locust patches into the interpreter).
"""

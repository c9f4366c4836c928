"""Readers for the traces `replay` plays back, one module per format behind one interface (base.ReplayFormat).

Formats (docs/operator/traffic.md, docs/operator/replay.md):
  - azure: Azure LLM inference traces 2023 / 2024, CSV `TIMESTAMP, ContextTokens, GeneratedTokens`, date-times;
  - burstgpt: BurstGPT, CSV `Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type`, seconds
    from the trace's start; 0 response tokens is a failed request;
  - mooncake: Mooncake JSONL `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (prefix blocks);
  - specdrill: a specdrill trace (a part file or a trace directory), its `scheduled_ns`;
  - csv: timestamps in seconds, one per line or a named column (module timestamps).

registry holds the table of formats (in detection order) and the entry points (`detect_format`, `read_arrivals`,
`read_contents`); streaming the bounded two-pass reading that the formats with lengths share.
"""

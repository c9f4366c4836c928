"""The other engines' step rules, one module per design, each a pure function over arrays.

The compiled kernel (serve_apps/sim/kernel.py) calls the same functions every step that `replay` calls on a
recorded step sequence, so what the simulator executes and what a check expects are one piece of code. A rule is
two calls: `decide` (the k of the step about to run, from the batch size and the rule's state) and `observe`
(what the step's verification told the rule). vLLM's batch-size lookup needs neither: it stays a table.
"""

RULE_TABLE, RULE_SGLANG, RULE_GATE = 0, 1, 2

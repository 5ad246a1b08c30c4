"""Studies: paired, equal-work comparisons of fixed arms across strata, with decision gates frozen
(registered by hash) before the first run.

Modules, one concept each:
  protocol   the protocol file (YAML) -> frozen Protocol; errors name file, line and field
  registry   canonical SHA-256 of a protocol + code revision, recorded in studies/registry.json
  ledger     the study's JSONL ledger (resume without re-running finished runs)
  runner     one real run per (stratum, arm) and the no-failure controls
  metrics    per-run metrics with their evidence class (opportunity ticks defined there)
  stats      paired differences, exact sign-flip tests, bootstrap intervals, gates
  wording    how a decision is worded on every page ("N of M gates passed as written, ...")
  families   stress families: the untouched-family ledger and ranking regions (controller-heldout)
  artifact   the study artifact (JSON, schema-validated)
  report     the study's HTML page
  cli        `xdc study register|run|report|check`
"""

"""The ground floor: what every process shares and nothing else in this repo is imported by it.

config (the run's typed configuration), eventlog (the structured JSONL log), topology (processes,
binds, links), provenance, schedule (the one place tokens, samples, rounds and steps convert),
journal (the coordinator's durable record, read by the store), and the typed messages that cross
processes (messages: reports to the coordinator; plans: the recovery plan and the epoch
announcement; fields: a site's checked reads of a body).
"""

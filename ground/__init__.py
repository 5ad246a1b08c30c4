"""The ground floor: what every process shares and nothing else in this repo is imported by it.

config (the run's typed configuration), eventlog (the structured JSONL log) and events (the
registry of every event), topology (processes, binds, links), provenance, schedule (the one place
tokens, samples, rounds and steps convert), journal (the coordinator's durable file, read by the
store) and records (its typed commit and epoch records), and the typed messages that cross
processes (messages: reports to the coordinator; plans: the recovery plan and the epoch
announcement; fields: a site's checked reads of a body).
"""

"""Running a cluster on this machine, as a library: the native launcher (local processes, Toxiproxy,
the run directory), its fork server and its progress display. Below `studies/` and `xdc/` (the
commands), above the processes' own packages."""

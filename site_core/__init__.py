"""The site's protocol decisions, pure: which plan to adopt next (`epochs`) and what adopting it means
(`adoption`). No torch, no sockets, no clock: the site agent (site_agent/) carries the decisions out
with its trainer, the WAN and the store; the simulator (sim/) carries the same decisions out on its
virtual clock, so the two cannot drift apart in what they decide, only in what it costs."""

"""The site: the process that trains (agent, rounds, trainer) and what it carries (state, checkpoints)."""

import logging

# The compose image leaves triton out (torch.compile only); torch's FlopCounterMode warns on import that
# it cannot count triton kernels. The model has none, so the warning says nothing about this run.
logging.getLogger("torch.utils.flop_counter").setLevel(logging.ERROR)

"""Drivers over the episode core: one agent on a few tasks (`runner`), whole evaluations with resume and reports
(`evaluation`, `report`), many episodes under asyncio (`rollouts`) or Ray (`ray_backend`), batch scoring of
completions (`scoring`), and the one retry policy for infrastructure failures (`infra`)."""

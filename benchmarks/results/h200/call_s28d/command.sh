#!/usr/bin/env bash
# Twenty-eighth session, call D (carry .debs; run from the repository root): the final
# library on torch 2.11 (the whole suite, with the rendezvous's fast give-up), the doctor
# (now with the open-file limit), and issue #7's ViT DDP step on 4 emulated 10 Gbit hosts,
# mccl and gloo alternating, two rounds (not run since the twentieth session).
OUT=$OUT DEADLINE_S=480 VIT_VARIANTS="mccl: gloo: mccl2: gloo2:" \
  bash benchmarks/h200/run_all.sh env suite doctor vit

"""`hintkv sim`: the calibrated simulator. The real scheduler, KV manager, SAM, policies and tier
bookkeeping run in simulated time; only the model forward and the copies are replaced, by a cost
model interpolated from measured profiles (`profile`, `costs`). `clock` is the discrete-event
clock; `calibrate` measures the `local` profile with the real engine; `main` is the command.
"""

"""What a run costs before it starts: time from a model of the hardware (estimate), dollars from
SkyPilot's catalog (prices), both per accelerator and calibrated by earlier runs (plan)."""

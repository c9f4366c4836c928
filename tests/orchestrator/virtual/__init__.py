"""Tests of orchestrator/virtual/: campaigns, fixed-batch experiments and synthetic acceptance in virtual time."""

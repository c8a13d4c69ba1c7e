"""Steps to target against TRL: time to exact-J targets as optimiser steps × seconds per step (design.py)."""

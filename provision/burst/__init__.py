"""Bursting: the programs Slurm runs on a head node to create elastic nodes when jobs wait
(ResumeProgram), remove them when idle (SuspendProgram) and clean up after a failed start
(ResumeFailProgram), plus a reconciler a systemd timer runs.

Everything here runs on the head with nothing but the Python standard library: the burst role
puts this project's wheel on the head and runs `python3 -m provision.burst` from it (a wheel of
pure Python imports straight from its zip file), so the head needs no package index. The
configuration is the JSON file the render writes (files/burst/burst.json); see config.py.
"""

"""`python -m provision.providers.lab`: build (or find) the lab base image and print its name."""

from provision.providers.lab.image import ALIAS, debian_mirror, ensure_image

built, took = ensure_image(debian_mirror())
print(f"{built} ({ALIAS}): " + (f"built in {took:.0f}s" if took else "already there"))

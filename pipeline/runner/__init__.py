"""What runs inside the runner image: the Harbor driver (`benchseal trial run`), its environment and tunings."""

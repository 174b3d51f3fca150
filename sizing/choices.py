"""Enumerations of sizing shared by the suggestion service, FilterSet, API and pages."""

from django.db import models


class Fits(models.TextChoices):
    """Where a suggested profile fits now (`fleet.fit.Impact.fits`)."""

    SAME_GPU = "same_gpu", "Fits on its GPU"
    MOVE = "move", "Needs a move"
    NOWHERE = "nowhere", "Fits nowhere"

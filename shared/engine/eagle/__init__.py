"""Feature-level drafts (EAGLE family): a head that drafts in the target's feature space."""

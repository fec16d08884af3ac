"""The implementation of the lab stand-in (not part of the real SGLang layout)."""

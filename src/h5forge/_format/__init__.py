"""The file format: names, storage of the small columns and indexes, codecs, row files, diagnostics.
Nothing here decodes pictures or knows about field kinds."""

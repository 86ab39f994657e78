"""The file format: names, storage of the small columns and indexes, codecs, segments, diagnostics.
Nothing here decodes pictures or knows about field kinds."""

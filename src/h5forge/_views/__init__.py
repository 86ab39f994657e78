"""What users look at: a version's info, the diff between versions, previews and their drawing."""

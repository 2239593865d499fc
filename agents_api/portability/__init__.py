"""Data rights and moving data between servers: what is kept about a user, or an agent's
memory, as one JSON document (``export``), erased (``services.data_rights``), and put back
(``restore``, ``importing``).

A document is a header and a list of sections, each a list of records of one kind
(``sections``). The record shapes (``records``) serve the export, the import and the
OpenAPI description alike.
"""

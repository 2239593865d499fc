"""What an ``OPTIONS`` request is told about an API view: DRF's answer without the view's
docstring (``description``), which is written for the people who read the code."""

from rest_framework.metadata import SimpleMetadata


class Metadata(SimpleMetadata):
    def determine_metadata(self, request, view):
        metadata = super().determine_metadata(request, view)
        metadata.pop("description", None)
        return metadata

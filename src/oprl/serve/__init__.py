"""oprl's parts behind other training APIs: ``oprl.serve.tinker`` speaks the Tinker API (``oprl serve tinker``)."""

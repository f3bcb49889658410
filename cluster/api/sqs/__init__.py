"""The Amazon SQS API on every node's HTTP port (docs/sqs.md): an adapter in the API layer that
reads both SQS wire protocols, runs each action as the node actions the REST API uses
(``actions.py``) and answers in SQS's terms.

Routes: ``POST /`` (the JSON 1.0 protocol, ``X-Amz-Target: AmazonSQS.<Action>``, or the query
protocol, ``Action=...``) and ``POST /{account}/{queue}`` (the query protocol posted to a queue URL).

Authentication: a cluster without API tokens (the loopback ``raftmq dev``) accepts any AWS
credentials, as the emulators do. AWS signatures (SigV4) are not checked yet, so a cluster with
tokens refuses every SQS request (403 ``InvalidClientTokenId``), here and in the authentication
middleware (``cluster/api/auth.py``): an SQS request never gets past the tokens.

The package itself imports nothing: ``routes.add_sqs_routes`` wires it into the app, and the
authentication middleware reads ``wire`` alone (importing the routes there would be a cycle).
"""

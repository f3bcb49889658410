"""The Amazon SQS API on every node's HTTP port (docs/sqs.md): an adapter in the API layer that
reads both SQS wire protocols, runs each action as the node actions the REST API uses
(``actions.py``) and answers in SQS's terms.

Routes: ``POST /`` (the JSON 1.0 protocol, ``X-Amz-Target: AmazonSQS.<Action>``, or the query
protocol, ``Action=...``) and ``POST /{account}/{queue}`` (the query protocol posted to a queue URL);
``GET /v1/sqs/credentials`` answers a token's own SigV4 credentials.

Authentication: a cluster without API tokens (the loopback ``raftmq dev``) accepts any AWS
credentials, as the emulators do. A cluster with tokens checks every request's AWS Signature
Version 4 (``sigv4.py``): the access key id is a token's name, the secret access key one derived
from the cluster secret for that token (``cluster/config/keys.py``); the token's permissions then
apply to the queue the action names (``access.py``).

The package itself imports nothing: ``routes.add_sqs_routes`` wires it into the app, and the
authentication middleware reads ``wire`` alone (importing the routes there would be a cycle).
"""

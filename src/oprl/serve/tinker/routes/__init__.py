"""The Tinker API's routes as one ``APIRouter`` per resource, which ``app.create_app`` mounts: ``service`` (health,
client config, sessions, polling futures, the endpoints refused with a reason), ``training`` (training models:
create, forward_backward, optim_step, save/load) and ``sampling`` (sampling clients and their requests).
``common`` holds what they share: the server behind a request, a JSON body, a future's answer."""

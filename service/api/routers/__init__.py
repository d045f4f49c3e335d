"""One APIRouter per resource, included by ``service.api.app.create_app``."""

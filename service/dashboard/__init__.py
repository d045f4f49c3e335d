"""The dashboard's static files (index.html, app.js, style.css), served by ``service.api.routers.dashboard``."""

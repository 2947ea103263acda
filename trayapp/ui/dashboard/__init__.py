"""The dashboard window (`Dashboard`) and its parts: the rate-vs-time and rate-vs-context plots,
the model cards and the alerts panel."""

from trayapp.ui.dashboard.alerts import AlertsPanel, alert_text, evidence_text
from trayapp.ui.dashboard.cards import ModelCard, hardware_line, ttft_text
from trayapp.ui.dashboard.context_plot import RateContextPlot
from trayapp.ui.dashboard.time_plot import RateTimePlot, floor_label, time_span_s
from trayapp.ui.dashboard.window import WINDOW_S, Dashboard

__all__ = [
    "WINDOW_S",
    "AlertsPanel",
    "Dashboard",
    "ModelCard",
    "RateContextPlot",
    "RateTimePlot",
    "alert_text",
    "evidence_text",
    "floor_label",
    "hardware_line",
    "time_span_s",
    "ttft_text",
]

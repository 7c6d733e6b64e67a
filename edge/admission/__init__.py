"""Admission: the priority queue by tier, fair between users, in front of a router over GPU replicas."""

from edge.admission.dispatcher import Dispatcher
from edge.admission.slot import Slot
from edge.admission.ticket import NeverFits, Overloaded, OverloadReason, Ticket

__all__ = ["Dispatcher", "NeverFits", "OverloadReason", "Overloaded", "Slot", "Ticket"]

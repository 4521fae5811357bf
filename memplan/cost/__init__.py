"""Cost model: device profiles, roofline durations, calibration."""

from .model import Cost, roofline_s
from .profiles import BUILTIN, DeviceProfile, get_profile

__all__ = ["BUILTIN", "Cost", "DeviceProfile", "get_profile", "roofline_s"]

"""Precision modes (fp32, amp, amp-fp16, amp-bf16): what a mode trains with, and the comm hooks
that count what it puts on the wire."""

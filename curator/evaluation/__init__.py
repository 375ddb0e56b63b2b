"""Acceptance as the traffic sees it: eval prompts' categories mapped to the traffic's, and the weights that make a measured figure traffic-weighted."""

"""pfl-research's own accountants' noise multipliers, run in pfl's interpreter (never
perfed-ray's): reads a JSON list of cases {accountant, epsilon, delta, q, rounds} on
stdin and prints a JSON list of pfl's noise multipliers, in order."""

import json
import sys

from pfl.privacy.privacy_accountant import PLDPrivacyAccountant, RDPPrivacyAccountant

ACCOUNTANTS = {"rdp": RDPPrivacyAccountant, "pld": PLDPrivacyAccountant}

cases = json.load(sys.stdin)
print(
    json.dumps(
        [
            ACCOUNTANTS[c["accountant"]](
                num_compositions=c["rounds"],
                sampling_probability=c["q"],
                mechanism="gaussian",
                epsilon=c["epsilon"],
                delta=c["delta"],
            ).noise_parameter
            for c in cases
        ]
    )
)

"""How long each user's replies run, learnt from the replies that end: what the fair queue counts a
request's reply at when it dispatches it (deficit_round_robin.py), before its length is known.

A request's own max_tokens says little: the OpenAI SDK leaves it out and the server fills in the
tier's largest, so counted at max_tokens a user who left it out paid 1,040 KV tokens a turn for a
1-token reply against another's 36, and got 8 replies to its 213. Counted at the user's own average
instead, a user is charged what its replies really take: short replies, short charges; long
replies, a longer wait between turns. Settling each request's real length afterwards was tried: a
late charge or refund lands on whatever turn the user is in (or on none, once its queue emptied),
and a user that keeps a queue got refunds that a one-loop user lost.

A user not seen yet is counted at the average of every reply seen (`prior_tokens` before the first);
never more than the request's own max_tokens. Bounded: the least recently seen users are forgotten.
"""

from __future__ import annotations

from collections import OrderedDict


class ReplyLengths:
    def __init__(self, prior_tokens: int, alpha: float = 0.2, users: int = 65_536) -> None:
        self._alpha = alpha
        self._users = users
        self._overall = float(prior_tokens)
        self._overall_samples = 0
        self._by_user: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def estimate(self, user: str, max_new_tokens: int) -> int:
        """The reply tokens to count for a request of this user's, before it has run."""
        seen = self._by_user.get(user)
        average = seen[0] if seen is not None else self._overall
        return min(max_new_tokens, round(average))

    def observe(self, user: str, generated: int) -> None:
        """One of this user's replies ended with this many tokens."""
        self._overall_samples += 1
        self._overall = _step(self._overall, generated, self._alpha, self._overall_samples)
        average, samples = self._by_user.pop(user, (float(generated), 0))
        samples += 1
        self._by_user[user] = (_step(average, generated, self._alpha, samples), samples)
        if len(self._by_user) > self._users:
            self._by_user.popitem(last=False)


def _step(average: float, sample: int, alpha: float, samples: int) -> float:
    # Warm start, as ServiceRate: the first samples are averaged plainly, so a wrong prior goes at once.
    return average + max(alpha, 1.0 / samples) * (sample - average)

"""The profiler (`tandem profile`): verify cost vs batched tokens and context, the budget B, the cost model.

    cost_model.py   pure fitting (numpy): T_fwd = alpha*N_context + gamma*N_batched + delta, B, storage
    measure.py      real verify forwards on a ModelRunner (torch)
    cli.py          the command; the scheduler reads the stored profile (services.scheduler.budget)
"""
